-- A response an upstream keeps, found by the upstream's id (Store.gateway_response_id).
CREATE INDEX response_states_upstream ON response_states(upstream_id);
