package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dynamig/dynamig/config"
)

// maxGPUsPerEntry bounds COUNT in a GPU list: more GPUs than any node holds is a typo.
const maxGPUsPerEntry = 64

// ParseGPUList parses "MODEL[:COUNT],MODEL[:COUNT],..." into GPU specs, COUNT (1 to 64)
// defaulting to 1. MODEL is anything config.LookupModel accepts; NVML names contain spaces
// and may contain colons, so COUNT is split off at the last colon only when all digits follow
// it (spaces around either part are ignored). Errors name the bad entry and list the known
// models.
func ParseGPUList(s string) ([]GPUSpec, error) {
	known := func() string { return strings.Join(config.KnownModelNames(), ", ") }
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty GPU list: want MODEL[:COUNT],... (known models: %s)", known())
	}
	var out []GPUSpec
	for _, entry := range strings.Split(s, ",") {
		model, count := strings.TrimSpace(entry), 1
		if i := strings.LastIndexByte(model, ':'); i >= 0 && allDigits(strings.TrimSpace(model[i+1:])) {
			digits := strings.TrimSpace(model[i+1:])
			n, err := strconv.Atoi(digits)
			if err != nil || n < 1 || n > maxGPUsPerEntry {
				return nil, fmt.Errorf("GPU list entry %q: count %q must be a whole number from 1 to %d (known models: %s)",
					entry, digits, maxGPUsPerEntry, known())
			}
			model, count = strings.TrimSpace(model[:i]), n
		}
		if model == "" {
			return nil, fmt.Errorf("GPU list entry %q: no model: want MODEL[:COUNT] (known models: %s)", entry, known())
		}
		if _, ok := config.LookupModel(model); !ok {
			return nil, fmt.Errorf("GPU list entry %q: unknown model %q (known models: %s)", entry, model, known())
		}
		for range count {
			out = append(out, GPUSpec{Model: model})
		}
	}
	return out, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
