// A Go function on the provided.al2023 custom runtime, built with the official
// aws-lambda-go library exactly as for AWS Lambda (GOOS=linux, CGO_ENABLED=0, the
// binary named `bootstrap` at the zip's root). Thaw serves it unchanged.
package main

import (
	"context"
	"errors"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
)

type event struct {
	Name string `json:"name"`
	Fail bool   `json:"fail"`
	Exit bool   `json:"exit"`
}

func handler(ctx context.Context, ev event) (map[string]any, error) {
	if ev.Exit {
		os.Exit(3)
	}
	if ev.Fail {
		return nil, errors.New("asked to fail")
	}
	lc, _ := lambdacontext.FromContext(ctx)
	deadline, ok := ctx.Deadline()
	return map[string]any{
		"hello":        ev.Name,
		"runtime":      "go",
		"request_id":   lc.AwsRequestID,
		"function_arn": lc.InvokedFunctionArn,
		"function":     lambdacontext.FunctionName,
		"has_deadline": ok && !deadline.IsZero(),
		"handler":      os.Getenv("_HANDLER"),
	}, nil
}

func main() {
	lambda.Start(handler)
}
