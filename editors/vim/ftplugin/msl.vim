" Comments and indentation for .msl files.
if exists("b:did_ftplugin")
  finish
endif
let b:did_ftplugin = 1

setlocal comments=s1:/*,mb:*,ex:*/,:///,://
setlocal commentstring=//\ %s
setlocal expandtab shiftwidth=4 softtabstop=4

let b:undo_ftplugin = "setlocal comments< commentstring< expandtab< shiftwidth< softtabstop<"
