" Vim syntax file
" Language:    MSL (.msl model files, compiled by mslc)
" Maintainer:  the mslc project
" Source of truth: grammar/msl.pest (keywords) and crates/core/src/ops/registry.rs (op names);
" scripts/check_editor_grammars.py fails when a keyword or op is missing here.

if exists("b:current_syntax")
  finish
endif

let s:cpo_save = &cpo
set cpo&vim

syn case match

" ---------------------------------------------------------------- keywords
" Reserved everywhere (grammar/msl.pest: keyword).
syn keyword mslConditional   if else
syn keyword mslRepeat        for in
syn keyword mslStatement     return
syn keyword mslInclude       as
" import a.b.{C, D as E}: the module path and the imported names.
syn region  mslImport        matchgroup=mslInclude start="\<import\>" end="$" keepend oneline contains=mslImportAs,mslImportType,mslNamespace,mslLineComment,mslBlockComment
syn keyword mslImportAs      contained as
syn match   mslImportType    contained "\<\u\w*\>"
syn match   mslNamespace     contained "\<\l\w*\>"
syn keyword mslStorageClass  pub
syn keyword mslDeclare       let
syn keyword mslBoolean       true false

" Contextual keywords: only where the grammar makes them keywords, so `model: LlamaModel(..)`
" (a label) and `precision = Mixed` (a train field) stay names.
syn match   mslDeclare       "\<\%(const\|dims\)\>\ze\s\+\h\w*\s*="
syn match   mslDeclare       "\<\%(param\|buffer\)\>\ze\s\+\h\w*\s*:"
syn match   mslStatement     "\<input\>\ze\s\+\h\w*\s*:"
syn match   mslStatement     "\<output\>\ze\s\+\h\w*\s*="
syn match   mslStructure     "\<block\>\ze\s\+\h\w*\s*(" nextgroup=mslTypeName skipwhite
syn match   mslStructure     "\<model\>\ze\s\+\h\w*\s*{" nextgroup=mslTypeName skipwhite
syn match   mslStructure     "\<\%(precision\|parallel\|memory\)\>\ze\s\+\h\w*\s*{" nextgroup=mslTypeName skipwhite
syn match   mslStructure     "\<target\>\ze\s\+\h\w*\s*{" nextgroup=mslTypeName skipwhite
syn match   mslStructure     "\<train\>\ze\s\+\h\w*\s\+for\>" nextgroup=mslTypeName skipwhite
syn match   mslKeyword       "\<shard\>\ze\s*\""
syn match   mslTypeName      contained "\h\w*"
syn match   mslModelRef      "\%(\<train\s\+\h\w*\s\+for\s\+\)\@<=\h\w*"

" ---------------------------------------------------------------- types
syn match   mslDtype         "\%(@\|\.\)\@<!\<\%(f64\|f32\|f16\|bf16\|i64\|i32\|bool\)\>\%(\s*:\)\@!"
syn match   mslScalarType    "\.\@<!\<\%(int\|float\|str\|dtype\|shape\)\>\%(\s*:\)\@!"

" ---------------------------------------------------------------- ops (the registry)
" Ops are a match, not a keyword: a keyword would win over the label in
" `attention.self.query: LinearBias(..)` and over a named argument `max: 3`.
let s:ops = [
      \ 'abs', 'adam_update', 'adaptive_avg_pool2d', 'adaptive_avg_pool2d_grad', 'add',
      \ 'all_gather', 'all_reduce', 'attention', 'attention_grad', 'attention_lse', 'avg_pool2d',
      \ 'avg_pool2d_grad', 'batch_norm', 'broadcast_to', 'cast', 'causal_mask', 'concat',
      \ 'constant', 'conv2d', 'conv2d_grad_input', 'conv2d_grad_weight', 'cross_entropy',
      \ 'cross_entropy_grad', 'div', 'dropout', 'embedding', 'embedding_grad', 'erf', 'exp',
      \ 'fused_elementwise', 'fused_matmul', 'gelu', 'gelu_tanh', 'layer_norm',
      \ 'layer_norm_affine', 'layer_norm_affine_grad', 'layer_norm_grad', 'log', 'log_softmax',
      \ 'matmul', 'max', 'max_pool2d', 'max_pool2d_grad', 'maximum', 'mean', 'minimum', 'mse_loss',
      \ 'mul', 'neg', 'parallel_copy', 'pow', 'rank_slice', 'reciprocal', 'reduce_scatter', 'relu',
      \ 'reshape', 'rms_norm', 'rms_norm_grad', 'rms_norm_scale', 'rms_norm_scale_grad', 'rope',
      \ 'rope_cached', 'rope_table', 'rsqrt', 'select', 'sgd_update', 'sigmoid', 'sign', 'silu',
      \ 'slice', 'softmax', 'softplus', 'sqrt', 'square_sum', 'square_sum_finite', 'sub', 'sum',
      \ 'tanh', 'transpose'
      \ ]
let s:lib_functions = [
      \ 'zeros', 'ones', 'normal', 'uniform', 'adamw', 'adam', 'sgd', 'dynamic', 'fixed'
      \ ]
execute 'syn match mslBuiltin "\.\@<!\<\%(' . join(s:ops, '\|') . '\)\>\%(\s*:\)\@!"'
execute 'syn match mslLibFunction "\.\@<!\<\%(' . join(s:lib_functions, '\|') . '\)\>\%(\s*:\)\@!"'

" ---------------------------------------------------------------- literals
syn match   mslNumberError   "\<\d\+\h\w*"
syn match   mslNumber        "\<\d\+\>"
syn match   mslFloat         "\<\d\+\%(\.\d\+\%([eE][+-]\=\d\+\)\=\|[eE][+-]\=\d\+\)\>"
syn match   mslQuantity      "\<\d\+\%(\.\d\+\)\=\%([eE][+-]\=\d\+\)\=\%(KiB\|MiB\|GiB\|TiB\|PFLOPS\|TFLOPS\|GFLOPS\|FLOPS\|KB/s\|MB/s\|GB/s\|TB/s\|B/s\|KB\|MB\|GB\|TB\|B\)\w\@!" contains=mslUnit
syn match   mslUnit          contained "\%(KiB\|MiB\|GiB\|TiB\|PFLOPS\|TFLOPS\|GFLOPS\|FLOPS\|KB/s\|MB/s\|GB/s\|TB/s\|B/s\|KB\|MB\|GB\|TB\|B\)"
syn region  mslString        start=+"+ skip=+\\\\\|\\"+ end=+"+ end=+$+ contains=mslEscape,mslBadEscape,mslGlob
syn match   mslBadEscape     contained +\\.+
syn match   mslEscape        contained +\\[\\"nt]+
syn match   mslGlob          contained "\*\*\=\|[{},]"
syn match   mslWildcard      "\<_\>"
" Characters the grammar has no use for outside strings and comments.
syn match   mslError         +[;#$?^`'\\]+

" ---------------------------------------------------------------- annotations and operators
syn match   mslOperator      "|>\|\.\.\.\=\|->\|==\|!=\|<=\|>=\|&&\|||\|[-+*/%<>!~=@]"
syn match   mslTranspose     "\.\zsT\>"
syn match   mslAnnotation    "@\%(shard\|recompute\|f32\|f16\|bf16\|allow\)\>"
" The lint an `@allow(...)` names.
syn match   mslAnnotation    "\%(@allow(\s*\)\@<=unused\>"

" ---------------------------------------------------------------- names
" An instance: `label.path[i]: BlockName(` — the label and the block.
syn match   mslBlockRef      "\<\u\w*\ze\s*("
syn match   mslNamedArg      "\<\h\w*\ze\s*:[^:]" contains=NONE
syn match   mslLabel         "\<\h\w*\%(\.\h\w*\|\[[^\]\[]*\]\)*\ze\s*:\s*\u\w*\s*(" contains=mslNumber,mslOperator
syn match   mslWord          "\<1f1b\>"

" Defined last: at the same column a later item wins, so `//` is a comment, not two `/`.
" ---------------------------------------------------------------- comments
syn keyword mslTodo          contained TODO FIXME XXX NOTE
syn match   mslLineComment   "//.*$" contains=mslTodo,@Spell
syn match   mslDocComment    "///\%(/\)\@!.*$" contains=mslTodo,@Spell
" Block comments do not nest (grammar/msl.pest: block_comment).
syn region  mslBlockComment  start="/\*" end="\*/" contains=mslTodo,@Spell
syn sync ccomment mslBlockComment minlines=50

" ---------------------------------------------------------------- links
hi def link mslTodo          Todo
hi def link mslLineComment   Comment
hi def link mslDocComment    SpecialComment
hi def link mslBlockComment  Comment
hi def link mslConditional   Conditional
hi def link mslRepeat        Repeat
hi def link mslStatement     Statement
hi def link mslInclude       Include
hi def link mslStorageClass  StorageClass
hi def link mslDeclare       Keyword
hi def link mslKeyword       Keyword
hi def link mslStructure     Structure
hi def link mslTypeName      Typedef
hi def link mslModelRef      Type
hi def link mslImportAs      Include
hi def link mslImportType    Type
hi def link mslNamespace     Identifier
hi def link mslBoolean       Boolean
hi def link mslDtype         Type
hi def link mslScalarType    Type
hi def link mslBuiltin       Function
hi def link mslLibFunction   Function
hi def link mslNumber        Number
hi def link mslFloat         Float
hi def link mslQuantity      Number
hi def link mslUnit          Special
hi def link mslWord          Constant
hi def link mslString        String
hi def link mslEscape        SpecialChar
hi def link mslBadEscape     Error
hi def link mslGlob          Special
hi def link mslWildcard      Special
hi def link mslAnnotation    PreProc
hi def link mslOperator      Operator
hi def link mslTranspose     Operator
hi def link mslLabel         Label
hi def link mslBlockRef      Type
hi def link mslNamedArg      Identifier
hi def link mslNumberError   Error
hi def link mslError         Error

let b:current_syntax = "msl"

let &cpo = s:cpo_save
unlet s:cpo_save
