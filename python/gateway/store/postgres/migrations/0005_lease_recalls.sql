-- A lease another process has asked back (gateway.funds: a recall), until its owner answers.
ALTER TABLE leases ADD COLUMN recalled boolean NOT NULL DEFAULT false;
