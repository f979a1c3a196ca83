" .msl files are mslc model files.
autocmd BufRead,BufNewFile *.msl setfiletype msl
