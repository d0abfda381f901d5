package state

// shrinking is a map that gives back the room of deleted entries: a Go map
// never does, so after 10,000 volumes were mounted and unmounted the states'
// maps would keep their tables for 10,000. peak is the most entries the map
// held since it was last made.
type shrinking struct{ peak int }

// minShrink is the size under which a map is left as it is: the room is
// small and rebuilding would be churn.
const minShrink = 1024

// shrink returns m, or a copy of m when m holds under a quarter of its
// peak; it is called after every change of m. A copy costs O(len(m)) and
// comes after at least 3/4 of the peak were deleted: O(1) per deletion.
func shrink[K comparable, V any](s *shrinking, m map[K]V) map[K]V {
	n := len(m)
	if n > s.peak {
		s.peak = n
		return m
	}
	if s.peak < minShrink || n >= s.peak/4 {
		return m
	}
	out := make(map[K]V, n)
	for k, v := range m {
		out[k] = v
	}
	s.peak = n
	return out
}
