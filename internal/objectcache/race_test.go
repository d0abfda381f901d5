//go:build race

package objectcache

// raceEnabled: the race detector's instrumentation enlarges goroutine
// stacks and allocations, which TestEntryBytes then allows for.
const raceEnabled = true
