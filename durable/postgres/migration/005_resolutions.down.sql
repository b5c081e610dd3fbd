-- 005_resolutions.down.sql
-- Drops the table 005 added, and with it the record of every operator
-- resolution (the resolved results stay in idempotency_requests). resolve
-- refuses to run until 005 is applied again.

DROP TABLE IF EXISTS idempotency_requests_resolutions;
