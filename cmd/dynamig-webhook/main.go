// Command dynamig-webhook is dynamig's mutating admission webhook: it gives GPU pods that
// name no scheduler schedulerName: dynamig-scheduler, as HAMi's webhook does.
package main

import (
	"os"

	"github.com/dynamig/dynamig/cmd/dynamig-webhook/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr))
}
