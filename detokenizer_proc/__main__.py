from detokenizer_proc.detokenizer_process import main

main()
