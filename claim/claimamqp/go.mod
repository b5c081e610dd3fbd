module github.com/oncekey/oncekey/claim/claimamqp

go 1.26.0

require github.com/oncekey/oncekey v0.0.0-00010101000000-000000000000

require github.com/rabbitmq/amqp091-go v1.17.0 // indirect

replace github.com/oncekey/oncekey => ../..
