"""Leadership: leader election on a Lease (``election``) and the gate that starts and stops the work loops and
refuses writes once leadership is lost (``gate``).

May import: ``loops``, ``core``, ``api``. Imported by: ``handlers``, ``__main__``.
"""
