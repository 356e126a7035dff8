from client.chat_shell import main

main()
