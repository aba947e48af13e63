"""Exit statuses of `lanner serve` and of its children: a protocol between them.

The supervisor reads a child's status to choose between restarting it and halting
(gunicorn's WORKER_BOOT_ERROR), and scripts read the server's (the contract: 0 clean, 1 start-up refused).
"""
EXIT_OK = 0
EXIT_START_REFUSED = 1   # bad config, port in use, data directory unwritable or held by another server
EXIT_CHILD_CRASHED = 1   # a child's unexpected exception: the supervisor restarts it
EXIT_BOOT_ERROR = 3      # a worker cannot replay its shard: the supervisor halts instead of looping
EXIT_UNSAVED = 4         # a worker stopped, but some state could not be written (it logged each queue)
