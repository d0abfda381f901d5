package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/onsi/ginkgo/v2/types"
)

// Load reads a ginkgo v2 JSON report: the list of suite reports that
// --json-report writes (one for each suite run; not empty), or a single
// suite report.
func Load(r io.Reader) ([]types.Report, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, fmt.Errorf("empty ginkgo report")
	}
	if data[0] == '{' {
		var one types.Report
		if err := json.Unmarshal(data, &one); err != nil {
			return nil, fmt.Errorf("ginkgo report: %w", err)
		}
		return []types.Report{one}, nil
	}
	var reports []types.Report
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, fmt.Errorf("ginkgo report: %w", err)
	}
	if len(reports) == 0 {
		return nil, fmt.Errorf("ginkgo report holds no suite")
	}
	return reports, nil
}
