// Package backend opens the services the example programs run on.
//
// Each service the user names is used as named: PostgreSQL (-postgres or
// DATABASE_URL) and Redis (-redis or REDIS_URL). Each service not named is
// replaced by its embedded stand-in: a SQLite file (durable/sqlite) for
// PostgreSQL, an in-process Redis (miniredis) for Redis. So with nothing
// set, the examples run on a machine with nothing installed, and they never
// connect to a server the user did not name. [Backend.Describe] says which
// was chosen and why, for the program to print on start.
//
// A named Redis that does not answer does not stop a program: Redis only
// accelerates. [Open] logs a warning that the program runs on the durable
// store alone and keeps the client, which is used again once Redis
// answers. A named PostgreSQL that does not answer is an error: it is the
// source of truth.
//
// Every example program makes this same choice and prints the same lines
// about it, so it is made in one place. It is an
// internal package because it is scaffolding for the examples, not part of
// the library: in a real service you would open your own pool and client,
// as [Open] does, and drop the embedded stand-ins.
package backend
