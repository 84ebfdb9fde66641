"""The spaCy side: the transformer components and their shims, the swap of the proxy in
and out (with its guard), the listeners' layer mixes, the training guard, ``nlp.pipe``,
persistence (load and save hooks, the config record, ``restore()``), where the weights are
parked, and warm-up."""
