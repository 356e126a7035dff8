from zserve.http_proc.http_process import main

main()
