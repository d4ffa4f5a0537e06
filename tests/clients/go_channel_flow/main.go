// Channel.Flow with RabbitMQ's Go client: active=true is answered, active=false refused.
// Usage: go_channel_flow AMQP_URL; prints one line per step for the Python test to check.
package main

import (
	"errors"
	"fmt"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"
)

func main() {
	conn, err := amqp.Dial(os.Args[1])
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		fmt.Println("channel:", err)
		os.Exit(1)
	}
	fmt.Println("flow true:", ch.Flow(true))
	err = ch.Flow(false)
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		fmt.Printf("flow false: %d %s\n", amqpErr.Code, amqpErr.Reason)
	} else {
		fmt.Println("flow false:", err)
	}
	if reason := <-closed; reason != nil {
		fmt.Printf("connection closed: %d %s\n", reason.Code, reason.Reason)
	}
}
