from zserve.tokenizer_proc.tokenizer_process import main

main()
