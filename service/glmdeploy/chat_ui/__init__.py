"""The Streamlit chat UI a node serves (roles/chat_ui)."""
