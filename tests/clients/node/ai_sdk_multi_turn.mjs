// Vercel AI SDK multi-turn with its default settings (store: true), as an app keeps a chat going: the second
// turn sends the first turn's messages back, which the SDK turns into item_reference inputs.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

const openai = createOpenAI({ baseURL: process.env.GATEWAY_URL + "/v1", apiKey: process.env.GATEWAY_KEY });
const model = openai.responses("mock");

const messages = [{ role: "user", content: "What is the capital of France?" }];
const first = await generateText({ model, messages });
messages.push(...first.response.messages);
messages.push({ role: "user", content: "And of Germany?" });
const second = streamText({ model, messages });
let streamed = "";
for await (const part of second.textStream) streamed += part;

console.log(JSON.stringify({
  first: first.text,
  second: streamed,
  firstResponseId: first.response.id,
  sentSecond: (await second.request).body,
}));
