-- privmatch pgbench load tests: run once at a party as its operator (psql -v app=ROLE -v
-- password=PW). Makes the application login the load runs as: a member of
-- privmatch_application (the SQL front door and nothing else of privmatch), owning a schema
-- of its own for the staging table of sealed inputs and the outcomes.
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L IN ROLE privmatch_application', :'app', :'password')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app') \gexec
SELECT format('ALTER ROLE %I PASSWORD %L', :'app', :'password') \gexec
SELECT format('CREATE SCHEMA IF NOT EXISTS privmatch_bench AUTHORIZATION %I', :'app') \gexec
