// Command runtime-tools builds the real container runtime test/kubeletnode's nodes on
// containerd run (test/kubeletnode/runtimetools) into the user's cache directory and prints its
// directory: make test runs it beside lint, so that the lanes find it built. Without root, where
// those nodes cannot run (their tests skip), it builds nothing.
package main

import (
	"fmt"
	"os"

	"github.com/dynamig/dynamig/test/kubeletnode/runtimetools"
)

func main() {
	if os.Geteuid() != 0 {
		fmt.Println("the real runtime: not built (its nodes run as root only)")
		return
	}
	dir, err := runtimetools.Dir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("the real runtime:", dir)
}
