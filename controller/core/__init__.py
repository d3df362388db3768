"""The controller's foundation: settings, the context every manager shares (``context``), views of slices and
DeviceTaintRules (``slices``) and of claims and DeviceClasses (``claims``) with what their parsers share
(``parsing``), the API writer (``kube``), kopf's bounded decoder (``kopf_json``), metrics, the work queue,
interpreter tuning (``runtime``), RBAC rules.

May import: ``api`` only. Imported by: every other package of the controller.
"""
