from zserve.client.chat_shell import main

main()
