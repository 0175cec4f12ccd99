package repo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDockerfiles checks each images/<binary>/Dockerfile against the repository, since no
// image builder runs in the tests: it builds ./cmd/<binary> (which exists) with the module file
// `make images` passes and a Go that builds every supported minor, stamps the version package,
// copies the binary where its ENTRYPOINT runs it, and runs as non-root on a static base unless
// it is the device plugin (cgo for NVML, root for the kubelet's sockets).
func TestDockerfiles(t *testing.T) {
	goVersion := newestGoLine(t)
	files, _ := filepath.Glob(filepath.Join(root, "images", "*", "Dockerfile"))
	cmds, _ := filepath.Glob(filepath.Join(root, "cmd", "dynamig-*"))
	var want []string
	for _, c := range cmds {
		if name := filepath.Base(c); name != "dynamig-sandbox" { // the sandbox is not shipped
			want = append(want, name)
		}
	}
	if len(files) != len(want) {
		t.Errorf("%d Dockerfiles for the shipped binaries %v", len(files), want)
	}
	for _, f := range files {
		name := filepath.Base(filepath.Dir(f))
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		df := string(raw)
		check := func(ok bool, what string) {
			if !ok {
				t.Errorf("images/%s/Dockerfile: %s", name, what)
			}
		}
		_, err = os.Stat(filepath.Join(root, "cmd", name, "main.go"))
		check(err == nil, "no cmd/"+name)
		check(strings.Contains(df, "golang:"+goVersion+"-"), "the build stage's Go is not "+goVersion+", the newest go line of the supported minors' module files")
		check(strings.Contains(df, "ARG MODFILE=go.mod") && strings.Contains(df, "COPY k8s/ k8s/") && strings.Contains(df, "go build -modfile=${MODFILE}"), "does not build with the module file of the minor make images passes")
		check(strings.Contains(df, "-o /out/"+name+" ./cmd/"+name), "does not build ./cmd/"+name+" into /out/"+name)
		check(strings.Contains(df, "-X github.com/dynamig/dynamig/version.version=${VERSION}") &&
			strings.Contains(df, "-X github.com/dynamig/dynamig/version.commit=${COMMIT}"), "does not stamp the version package")
		check(strings.Contains(df, "COPY --from=build /out/"+name+" /usr/local/bin/"+name), "does not copy the binary to /usr/local/bin")
		check(strings.Contains(df, `ENTRYPOINT ["/usr/local/bin/`+name+`"]`), "ENTRYPOINT is not the binary")
		if name == "dynamig-device-plugin" {
			check(strings.Contains(df, "CGO_ENABLED=1") && strings.Contains(df, "FROM gcr.io/distroless/base-"), "needs cgo on a glibc base")
		} else {
			check(strings.Contains(df, "CGO_ENABLED=0") && strings.Contains(df, "FROM gcr.io/distroless/static-") && strings.Contains(df, "USER 65532:65532"),
				"must be static, on distroless static, as non-root")
		}
	}
}
