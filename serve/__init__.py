"""The adapter to vLLM, on the ground floor beside ``draftsmith.decode``: everything draftsmith says to a vLLM
server, and nothing about what the stages do with it.

- :mod:`draftsmith.serve.settings`: the one server-settings schema (``data.vllm.*`` and ``serve.*`` nest it);
- :mod:`draftsmith.serve.server`: is vLLM importable, how to launch it (:class:`ServerSpec`), and its
  lifecycle (:class:`VllmServer`: always stopped, also when the process that started it is killed);
- :mod:`draftsmith.serve.client`: the OpenAI-compatible client (model probe, completions, streaming);
- :mod:`draftsmith.serve.metrics`: the spec-decode counters of ``/metrics``;
- :mod:`draftsmith.serve.schedule`: vLLM's batch-size K schedule (``num_speculative_tokens_per_batch_size``)
  from the measured K per concurrency band.

vLLM is never imported here: it lives in its own venv (it pins its own torch and transformers).
The stages (train's datagen, eval's serving A/B, the monitor) call this room; it imports none of them,
and its errors name the key the caller's user typed (the settings' ``KEY``).
"""
