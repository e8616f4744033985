"""Watching a served draft: live acceptance from vLLM's /metrics against what promotion measured, and alert rules.

``window`` (the window arithmetic and the drift/floor rules), ``poll`` (the poll loop), ``reference`` (the
promoted version's reference acceptance and the retrain command), ``alert_rules`` (the rules as a Prometheus
rule file). Above the ground floor (artifacts, decode, serve); it never imports train, eval or the spine.
"""
