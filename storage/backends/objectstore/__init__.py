"""A pylog root on an object store: :class:`~pylog.storage.backends.objectstore.storage.ObjectStorage`
(the :class:`~pylog.storage.backends.base.Storage` the log engine runs on) over
:class:`~pylog.storage.backends.objectstore.client.ObjectClient` (the requests to the store).

Layers, top down: ``storage`` (the working copy published by commits); ``commitlog`` (finding
and extending the newest state), ``orphans`` (the sweep), ``outside`` (objects outside the
state: staged sink data, consumer offsets), ``worktree`` (the working copy), ``reads`` (ranged
reads and their cache); ``keys``, ``dirindex``, ``overlay`` (object keys and inline files,
directory listings, 8-byte patches); ``snapshot`` (the state and its commit documents) and
``client``; ``options`` (the storage options, pylog's own declared once).
"""
