// openai-node: a text turn, a streamed turn chained with previous_response_id, and input_items.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL + "/v1", apiKey: process.env.GATEWAY_KEY, maxRetries: 0 });
const first = await client.responses.create({ model: "mock", input: "hello" });
const stream = await client.responses.create({
  model: "mock", input: "again", previous_response_id: first.id, stream: true,
});
const types = [];
let final;
for await (const event of stream) {
  types.push(event.type);
  if (event.type === "response.completed") final = event.response;
}
const items = await client.responses.inputItems.list(final.id, { order: "asc" });
console.log(JSON.stringify({
  first: first.output_text,
  second: final.output_text,
  types,
  inputItems: items.data,
}));
