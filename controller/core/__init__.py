"""The controller's foundation: settings, the context every manager shares (``context``), views of slices and
claims (``model``), the API writer (``kube``), kopf's bounded decoder (``kopf_json``), metrics, the work queue,
interpreter tuning (``runtime``), RBAC rules.

May import: ``api`` only. Imported by: every other package of the controller.
"""
