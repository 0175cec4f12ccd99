// Command vet is go vet's own analyzer suite (cmd/vet's, from golang.org/x/tools) for `make
// lint`, run as `go vet -vettool`, which analyses only this module's packages.
//
// go vet runs its tool on every package of the import graph, dependencies included, to
// compute the facts some analyzers pass between packages (printf wrappers, mostly). On
// make lint's graph (Kubernetes' scheduler, API server, kubelet, controller manager, Helm)
// that is some 3,000 packages parsed and type-checked once more: 390 CPU-seconds of a cold
// make test on 2 cores, for diagnostics that are never reported. Here a dependency outside
// this module gets no facts: the printf check still knows the standard library's printf
// functions (it lists them) and this module's own wrappers (their facts are computed), but
// not a dependency's (klog.Infof), which this code base calls through structured logging.
package main

import (
	"encoding/json"
	"os"
	"strings"

	"golang.org/x/tools/go/analysis/passes/appends"
	"golang.org/x/tools/go/analysis/passes/asmdecl"
	"golang.org/x/tools/go/analysis/passes/assign"
	"golang.org/x/tools/go/analysis/passes/atomic"
	"golang.org/x/tools/go/analysis/passes/bools"
	"golang.org/x/tools/go/analysis/passes/buildtag"
	"golang.org/x/tools/go/analysis/passes/cgocall"
	"golang.org/x/tools/go/analysis/passes/composite"
	"golang.org/x/tools/go/analysis/passes/copylock"
	"golang.org/x/tools/go/analysis/passes/defers"
	"golang.org/x/tools/go/analysis/passes/directive"
	"golang.org/x/tools/go/analysis/passes/errorsas"
	"golang.org/x/tools/go/analysis/passes/framepointer"
	"golang.org/x/tools/go/analysis/passes/hostport"
	"golang.org/x/tools/go/analysis/passes/httpresponse"
	"golang.org/x/tools/go/analysis/passes/ifaceassert"
	"golang.org/x/tools/go/analysis/passes/loopclosure"
	"golang.org/x/tools/go/analysis/passes/lostcancel"
	"golang.org/x/tools/go/analysis/passes/nilfunc"
	"golang.org/x/tools/go/analysis/passes/printf"
	"golang.org/x/tools/go/analysis/passes/shift"
	"golang.org/x/tools/go/analysis/passes/sigchanyzer"
	"golang.org/x/tools/go/analysis/passes/slog"
	"golang.org/x/tools/go/analysis/passes/stdmethods"
	"golang.org/x/tools/go/analysis/passes/stdversion"
	"golang.org/x/tools/go/analysis/passes/stringintconv"
	"golang.org/x/tools/go/analysis/passes/structtag"
	"golang.org/x/tools/go/analysis/passes/testinggoroutine"
	"golang.org/x/tools/go/analysis/passes/tests"
	"golang.org/x/tools/go/analysis/passes/timeformat"
	"golang.org/x/tools/go/analysis/passes/unmarshal"
	"golang.org/x/tools/go/analysis/passes/unreachable"
	"golang.org/x/tools/go/analysis/passes/unsafeptr"
	"golang.org/x/tools/go/analysis/passes/unusedresult"
	"golang.org/x/tools/go/analysis/passes/waitgroup"
	"golang.org/x/tools/go/analysis/unitchecker"
)

// module is the import path prefix of the packages analysed.
const module = "github.com/dynamig/dynamig"

func main() {
	if skip, out := dependencyFactsOnly(os.Args[1:]); skip {
		// An empty facts file: the go command caches it, and importers read no facts.
		if err := os.WriteFile(out, nil, 0o666); err != nil {
			os.Stderr.WriteString("vet: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	unitchecker.Main(
		appends.Analyzer, asmdecl.Analyzer, assign.Analyzer, atomic.Analyzer, bools.Analyzer,
		buildtag.Analyzer, cgocall.Analyzer, composite.Analyzer, copylock.Analyzer,
		defers.Analyzer, directive.Analyzer, errorsas.Analyzer, framepointer.Analyzer,
		httpresponse.Analyzer, hostport.Analyzer, ifaceassert.Analyzer, loopclosure.Analyzer,
		lostcancel.Analyzer, nilfunc.Analyzer, printf.Analyzer, shift.Analyzer,
		sigchanyzer.Analyzer, slog.Analyzer, stdmethods.Analyzer, stdversion.Analyzer,
		stringintconv.Analyzer, structtag.Analyzer, tests.Analyzer, testinggoroutine.Analyzer,
		timeformat.Analyzer, unmarshal.Analyzer, unreachable.Analyzer, unsafeptr.Analyzer,
		unusedresult.Analyzer, waitgroup.Analyzer,
	)
}

// dependencyFactsOnly reports whether the go command asks for a package outside the module
// only for its facts (the config file, the last argument, says VetxOnly), and where those go.
func dependencyFactsOnly(args []string) (bool, string) {
	if len(args) == 0 || !strings.HasSuffix(args[len(args)-1], ".cfg") {
		return false, ""
	}
	raw, err := os.ReadFile(args[len(args)-1])
	if err != nil {
		return false, "" // unitchecker reports it
	}
	var cfg struct {
		ImportPath string
		VetxOnly   bool
		VetxOutput string
	}
	if json.Unmarshal(raw, &cfg) != nil || !cfg.VetxOnly || cfg.VetxOutput == "" {
		return false, ""
	}
	inModule := cfg.ImportPath == module || strings.HasPrefix(cfg.ImportPath, module+"/")
	return !inModule, cfg.VetxOutput
}
