from zserve.scheduler_proc.scheduler_process import main

main()
