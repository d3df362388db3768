"""Admission: the verdict on each claim and template (``verdict``, pure), the MPS trust-domain tolerations a claim is
given and refused (``mps_tolerations``, pure), a new claim's opaque parameters in canonical bytes (``canonical``,
pure), the webhook server (``webhook``), its
certificate shared by every replica (``certificate``) and its registration in the chart-made configuration
(``webhook_config``).

May import: ``core``, ``api``. Imported by: ``handlers``, ``__main__``.
"""
