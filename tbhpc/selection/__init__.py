"""Selection package: the policy-relative training pool from probe results (Jeffreys bands, gates)."""
