from zserve.detokenizer_proc.detokenizer_process import main

main()
