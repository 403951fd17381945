-- The sandbox layers a measured kernel ran under (comma-separated, as the profiling worker's
-- jail names them: env, tmpdir, uid, netns, pidns, rlimits, nonewprivs, landlock, ...);
-- null for measurements made before the worker recorded them.
ALTER TABLE measurements ADD COLUMN sandbox VARCHAR;
