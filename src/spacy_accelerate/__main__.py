from spacy_accelerate.cli import main

main()
