from sparsetool.cli.main import main

main()
