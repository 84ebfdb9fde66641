from spacy_accelerate.cli.app import main

main()
