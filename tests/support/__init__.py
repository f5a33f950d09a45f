"""What the tests share that is not a fixture: starting private servers
(servers), checking that a refused call changed nothing (refusals), reading
a queue's raw Redis state (raw), the reference model of a queue (model) and
the chaos run (chaos). Fixtures stay in tests/conftest.py."""
