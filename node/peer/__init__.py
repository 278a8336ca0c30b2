"""The running node: its configuration, rounds with peers, state sync, resume, announcements and status."""
