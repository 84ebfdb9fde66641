"""Annotates texts (JSON on stdin) with an accelerated pipeline in one process, then with
``nlp.pipe(n_process=2)``, and prints both with what each worker ran on (JSON). Run by
``test_workers.py`` in a fresh interpreter: forking pytest's own process would put the
whole run at risk. argv: the pipeline (a folder, or "minilm-ewt"), the start method, then
``optimize()``'s options as JSON."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

import spacy
import torch
from annotations import annotations
from spacy.language import Language
from spacy.tokens import Doc

import spacy_accelerate
from spacy_accelerate.pipeline.pipe import overlapped_stages

Doc.set_extension("worker", default=None)


class NoteWorker:
    """Notes on each document the process, torch's threads and the runtime's."""

    def __init__(self, nlp: Language) -> None:
        self.nlp = nlp

    def __call__(self, doc: Doc) -> Doc:
        proxy = spacy_accelerate.accelerated_components(self.nlp)["transformer"]
        threads = proxy.session.config.intra_op_threads
        doc._.worker = [os.getpid(), torch.get_num_threads(), threads]
        return doc


@Language.factory("note_worker")
def make_note_worker(nlp: Language, name: str) -> NoteWorker:
    return NoteWorker(nlp)


def main() -> None:
    pipeline, start, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    multiprocessing.set_start_method(start)
    if pipeline == "minilm-ewt":
        from spacy_accelerate_samples.trained import load_trained_sample

        nlp = load_trained_sample()
    else:
        nlp = spacy.load(pipeline)
    texts = json.loads(sys.stdin.read())
    spacy_accelerate.optimize(nlp, **options)
    parent = spacy_accelerate.accelerated_components(nlp)["transformer"]
    nlp.add_pipe("note_worker")
    single = [annotations(doc) for doc in nlp.pipe(texts, batch_size=4)]  # overlapped
    overlapped = overlapped_stages(nlp) is not None and nlp.pipe.overlap
    docs = list(nlp.pipe(texts, batch_size=4, n_process=2))
    found = {
        "single": single,
        "double": [annotations(doc) for doc in docs],
        "workers": sorted({tuple(doc._.worker) for doc in docs}),
        "parent": [os.getpid(), parent.session.config.intra_op_threads],
        "served": parent.exported.summary,
        "overlapped": overlapped,
    }
    print(json.dumps(found))


if __name__ == "__main__":
    main()
