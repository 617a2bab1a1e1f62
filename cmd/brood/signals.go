package main

import (
	"context"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

func netSplit(s string) (string, string, error) { return net.SplitHostPort(s) }

func netJoin(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func netListen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
