package resolve

// marked is err, also matching mark (errors.Is), with err's text.
type marked struct{ err, mark error }

func (e marked) Error() string   { return e.err.Error() }
func (e marked) Unwrap() []error { return []error{e.err, e.mark} }
