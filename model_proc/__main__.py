from zserve.model_proc.worker_process import main

main()
