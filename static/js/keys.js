// Page-wide shortcuts. Ctrl (or Cmd) + Shift + O starts a new chat, Ctrl/Cmd + K searches the chats.
// Enter, Shift+Enter, Esc and Up belong to the message box (composer.js).

export function installShortcuts({ newChat, search }) {
  document.addEventListener("keydown", (event) => {
    const mod = event.ctrlKey || event.metaKey;
    if (!mod || event.altKey || event.isComposing) return;
    const key = event.key.toLowerCase();
    if (key === "o" && event.shiftKey) {
      event.preventDefault();
      newChat();
    } else if (key === "k" && !event.shiftKey) {
      event.preventDefault();
      search();
    }
  });
}
