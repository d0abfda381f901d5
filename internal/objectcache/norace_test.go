//go:build !race

package objectcache

// raceEnabled: see race_test.go.
const raceEnabled = false
