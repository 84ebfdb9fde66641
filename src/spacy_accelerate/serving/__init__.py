"""Serving: the module that stands in for the PyTorch transformer (its session, pickling,
fork reopen), the PyTorch weights parked while it serves, and the helper thread an
overlapped ``nlp.pipe`` runs it in."""
