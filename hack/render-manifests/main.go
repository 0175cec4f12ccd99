// Command render-manifests writes manifests/install.yaml and manifests/scheduler-config.yaml
// from the Helm chart manifests/charts/dynamig (`make manifests`).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/dynamig/dynamig/manifests"
)

func main() {
	files, err := manifests.Generated()
	if err != nil {
		fmt.Fprintln(os.Stderr, "render-manifests:", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join("manifests", n)
		if err := os.WriteFile(p, files[n], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "render-manifests:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", p)
	}
}
