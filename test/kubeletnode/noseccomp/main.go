// Command noseccomp is the OCI runtime of the test nodes on containerd: runc, minus the
// container's seccomp filter. runc applies seccomp only when built with libseccomp (cgo and
// the library's headers), which a machine with only Go and gcc lacks, and then refuses any
// config with a seccomp section; the kubelet asks for RuntimeDefault on every pod sandbox.
// So this drops linux.seccomp from the bundle's config.json and runs the runc beside it with
// the same arguments. Test containers run without a seccomp filter; nothing else changes.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	if err := dropSeccomp(bundle(os.Args[1:])); err != nil {
		fmt.Fprintln(os.Stderr, "noseccomp:", err)
		os.Exit(1)
	}
	runc := filepath.Join(filepath.Dir(os.Args[0]), "runc")
	if err := syscall.Exec(runc, append([]string{runc}, os.Args[1:]...), os.Environ()); err != nil {
		fmt.Fprintln(os.Stderr, "noseccomp: running runc:", err)
		os.Exit(1)
	}
}

// bundle is the --bundle (-b) argument's value, "" when there is none.
func bundle(args []string) string {
	for i, a := range args {
		for _, flag := range []string{"--bundle", "-b"} {
			if a == flag && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, flag+"="); ok {
				return v
			}
		}
	}
	return ""
}

// dropSeccomp removes linux.seccomp from dir's config.json, keeping everything else as it is.
func dropSeccomp(dir string) error {
	if dir == "" {
		return nil
	}
	file := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(raw, &spec); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	var linux map[string]json.RawMessage
	if l, ok := spec["linux"]; !ok || json.Unmarshal(l, &linux) != nil {
		return nil
	}
	if _, ok := linux["seccomp"]; !ok {
		return nil
	}
	delete(linux, "seccomp")
	if spec["linux"], err = json.Marshal(linux); err != nil {
		return err
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(file, out, 0o600)
}
