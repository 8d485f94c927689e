// Package keys names the Redis keys that more than one of the store's
// packages use: a run's record and event log, and the channel its events
// are published on. Each package names its own other keys beside its
// scripts.
package keys

// Prefix starts every key of runbox's.
const Prefix = "runbox:"

// A run's keys share a hash tag so that its scripts touch one slot.

// Run is a run's record, a hash.
func Run(id string) string { return Prefix + "run:{" + id + "}" }

// Events is a run's event log, a list.
func Events(id string) string { return Prefix + "run:{" + id + "}:events" }

// Channel is where a run's events are published as they are logged.
func Channel(id string) string { return Prefix + "events:" + id }
