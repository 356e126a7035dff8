"""`launch_server`: turns the command line into processes, and supervises them.

    launch_server ...                    one server on this node (launcher.py: tokenizer, scheduler,
                                         model worker ranks, detokenizer, HTTP; or only the worker ranks
                                         of a node other than 0 under --nnodes)
    launch_server --dp-size N [--router] a fleet (fleet/): N such servers on disjoint cores, each an
                                         ordinary launch_server, supervised and restarted, with
                                         sglang-router in front of them

Both start from the same resolved configuration (config_resolver.py) and write the same ready record
(server_ready.py). The model cache (model_cache.py) holds the demo model and GGUF metadata directories.
"""
