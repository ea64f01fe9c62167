// End-to-end specs start six processes; on a loaded two-core machine that takes tens of seconds.
jest.setTimeout(180_000);
