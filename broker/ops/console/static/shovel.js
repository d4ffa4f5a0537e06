// "Move messages" on a queue page, as RabbitMQ's management UI offers it with the shovel
// plugin (rabbitmq_shovel_management's shovel.js): a dynamic shovel from this queue to
// another, in this broker, that deletes itself once it has moved as many messages as the
// queue held when it started (src-delete-after: queue-length).
import { api, enc } from "./api.js";
import { act, h, messageSlot } from "./ui.js";

export function moveMessagesForm(vhost, queue, done) {
  const slot = messageSlot();
  const form = h("form", { class: "card", dataset: { role: "move-messages" }, onsubmit: async (e) => {
    e.preventDefault();
    const target = e.target.destination.value;
    const here = `amqp:///${enc(vhost)}`;
    await act(slot, async () => {
      await api("PUT", `/parameters/shovel/${enc(vhost)}/${enc(`Move from ${queue}`)}`, { value: {
        "src-uri": here, "src-queue": queue, "src-protocol": "amqp091", "src-prefetch-count": 1000,
        "src-delete-after": "queue-length",
        "dest-uri": here, "dest-queue": target, "dest-protocol": "amqp091", "dest-add-forward-headers": false,
        "ack-mode": "on-confirm",
      } });
      if (done) await done();
    }, `Moving the messages to ${target}: the shovel "Move from ${queue}" deletes itself when done`);
  } },
  h("h2", {}, "Move messages"),
  h("p", { class: "muted" }, "A shovel takes the ready messages of this queue to another queue of this vhost " +
    "(declared durable if missing), acking each only once the other queue has it."),
  h("label", {}, "Destination queue", h("input", { name: "destination", required: true })),
  h("div", { class: "actions" }, h("button", { class: "primary", type: "submit" }, "Move messages"), slot));
  return form;
}
