" Dumps Vim's syntax group at every byte of every file in the argument list, for
" scripts/check_editor_grammars.py. g:msl_dump_dir names the output folder; file N's dump is
" N.txt: first line the detected filetype, then one line per buffer line, the group names of
" its bytes joined by commas (empty where no group).
let s:n = 0
for s:f in argv()
  execute 'silent edit' fnameescape(s:f)
  syntax sync fromstart
  let s:out = [&filetype]
  for s:l in range(1, line('$'))
    let s:names = []
    for s:c in range(1, col([s:l, '$']) - 1)
      call add(s:names, synIDattr(synID(s:l, s:c, 1), 'name'))
    endfor
    call add(s:out, join(s:names, ','))
  endfor
  call writefile(s:out, g:msl_dump_dir . '/' . s:n . '.txt')
  let s:n += 1
endfor
qall!
