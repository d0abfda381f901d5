package downward

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"
)

// fieldValue is the value of the pod's field fieldPath, the kubelet's
// fieldpath.ExtractFieldPathAsString for a pod, with its error texts.
func fieldValue(pod *v1.Pod, fieldPath string) (string, error) {
	if field, key, ok := splitSubscript(fieldPath); ok {
		switch field {
		case "metadata.annotations":
			// The key must be a qualified name (a label key): an annotation's
			// is checked lower-cased, a label's as it is, as the kubelet
			// checks them.
			if errs := content.IsLabelKey(strings.ToLower(key)); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return pod.Annotations[key], nil
		case "metadata.labels":
			if errs := content.IsLabelKey(key); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return pod.Labels[key], nil
		default:
			return "", fmt.Errorf("fieldPath %q does not support subscript", fieldPath)
		}
	}
	switch fieldPath {
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	}
	return "", fmt.Errorf("unsupported fieldPath: %v", fieldPath)
}

// formatMap is the kubelet's file of labels or annotations: key="value"
// lines sorted by key, the value quoted as strconv.Quote quotes it, no
// newline after the last line.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	n := 0
	for k, v := range m {
		keys = append(keys, k)
		n += len(k) + len(v) + 4 // '=', two quotes, '\n'
	}
	slices.Sort(keys)
	out := make([]byte, 0, n)
	for i, k := range keys {
		if i > 0 {
			out = append(out, '\n')
		}
		out = append(out, k...)
		out = append(out, '=')
		out = strconv.AppendQuote(out, m[k])
	}
	return string(out)
}

// splitSubscript splits "field['key']" into field and key; ok is false
// for a path with no subscript (or an empty field before it), which is
// then read whole, as the kubelet splits it.
func splitSubscript(fieldPath string) (field, key string, ok bool) {
	s, found := strings.CutSuffix(fieldPath, "']")
	if !found {
		return fieldPath, "", false
	}
	field, key, found = strings.Cut(s, "['")
	if !found || field == "" {
		return fieldPath, "", false
	}
	return field, key, true
}
